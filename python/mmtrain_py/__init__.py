"""mmtrain's Python: where the ecosystem's library is Python, mmtrain runs it as a module of this
package, started only by the C++ runner (src/cli/python_runner.h) as
`python -P -m mmtrain_py.<room>.<module>`:

- media/  clips decoded with PyAV, MagiHuman's VAEs (diffusers) and text encoder (transformers)
- dcp/    PyTorch Distributed Checkpoints read and written by PyTorch's own DCP code
- plots/  figures drawn with matplotlib from the JSON specs mmtrain computes
"""
