"""Launchers: the emulated Ethernet cluster (`python -m src.launch.emulate`, Lion Cub Section 7's "Ethernet"), and
torchrun that ends with lioncub's line and exit status (`python -m src.launch.torchrun`).

- `netns`: names, rates, prerequisites, ownership locks and the `ip`/`tc` command runner;
- `cluster`: build and tear down the switch and host namespaces, veth links and tbf qdiscs;
- `procs`: one torchrun per host, output streamed with a host prefix, stopped as process groups;
- `cores`: each emulated host's disjoint share of the machine's cores and its ranks' thread count;
- `emulate`: the command line tying them together (docs/emulated_cluster.md);
- `smoke`: one checked allreduce that shows a cluster works and that its traffic crosses the links;
- `torchrun`: torchrun with torchrun's arguments, whose last line is rank 0's reason and exit status (2, 3, 75).
"""
