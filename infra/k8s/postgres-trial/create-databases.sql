-- The two databases of the control plane on the trial server: the planner's (the image's default, POSTGRES_DB)
-- and Prefect's.
CREATE DATABASE prefect;
