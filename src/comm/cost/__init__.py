"""The cost model of Table 1 (`model.py`), bytes per collective algorithm (`wire_bytes.py`), the network section of
the configuration (`network.py`) and its fitted alpha and beta (`network_fit.py`). Imports no torch."""
