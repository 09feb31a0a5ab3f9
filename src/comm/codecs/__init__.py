"""The wire format and the kernels that write and read it (Lion Cub, Sections 3.1, 4.2 and 6).

- `packing.py`: field widths, the planar layout of fields in words, pack and unpack;
- `reference.py`: every encoder and decoder as plain torch code, the reference the other backends must equal;
- `native.py` (+ `native_kernels.c`): the same encoders and decoders as C loops for the CPU;
- `triton_kernels.py`: the same as Triton kernels for the GPU (and the Triton interpreter on CPU);
- `backend.py`: the one explicit choice between them (`kernels: auto | torch | native | triton`).
Nothing here knows an optimizer: the optimizer's fused step (src/optim/fused/) builds on these.
"""
