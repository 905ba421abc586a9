"""The start-up room: the bench matrix at 120 s and 600 s engine start-up, one `planner bench --record` per row
(`python -m planner_core.lab.startup.matrix --jobs 2`; the records in docs/results/startup/)."""
