"""Read models over the store for people reviewing a run: the attempts' lineage, what incidents cost, the
incident list's rows and the launch checklist. What ``guardian incidents``, ``guardian checklist`` and the
HTML report show; they decide nothing for the live loop and write nothing.
"""
