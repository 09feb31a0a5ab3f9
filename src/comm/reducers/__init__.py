"""The reduction algorithms of Table 1 and the neighbours' baselines, each a `Reducer` (src/comm/reducers/base.py);
`registry.make_reducer` builds one by name, `auto` picks one from the alpha-beta model."""
