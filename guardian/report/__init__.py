"""``guardian report``: an incident's (or a run's) story as one self-contained HTML file that opens offline.

``assemble`` reads the store and the rollout dumps into a frozen ``model.Report``; everything after it is pure:
``series`` (signals over the kept and abandoned branches), ``story`` (markers, timeline, patches), ``svg`` (one
plot), ``page`` (the page). Lineage and cost are ``guardian.review``'s.
"""
