"""The history room: benchmarks of the database over a long generated history, run by hand, their figures in the
docs (database-and-sql.md, operations.md, replay.md):

- `python -m planner_core.lab.history.queries`: the history views and the prune on ~1.8M ticks;
- `python -m planner_core.lab.history.metrics_scrape`: one scrape of the metrics exporter over that history;
- `python -m planner_core.lab.history.replay_week`: a week recorded through `decide`, then `planner replay` timed.
"""
