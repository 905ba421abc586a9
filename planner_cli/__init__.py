"""The `planner` command line: the outermost layer, parsing arguments, calling one function per command and
printing; it may import everything below it (flows, runtime, lab, core)."""
