"""``guardian report``: an incident's (or a run's) story as one self-contained HTML file that opens offline.

``assemble`` reads the store and dumps into a frozen ``model.Report``; the rest is pure: ``series``, ``story``,
``svg``, ``page``. Lineage and cost are ``guardian.review``'s."""
