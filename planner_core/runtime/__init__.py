"""The runtime around the decision core: the tick service (`service`), the database (`store`), the traffic
sources, the connectors that apply decisions, the forward-pass ingest, replay, reports and the metrics exporter.

It may import the core; it never imports the lab (`planner_core.lab`), the flows or the CLI.
"""
