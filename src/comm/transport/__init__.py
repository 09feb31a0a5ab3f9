"""Pipeline plumbing shared by the reducers and the optimizer's steps: chunk plans and the pipeline that keeps
collectives in flight (`pipeline.py`), reusable buffers (`workspace.py`), the device a collective needs
(`device.py`) and small collective wrappers (`collectives.py`)."""
