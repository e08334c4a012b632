# Sourced by the other scripts: points the build at the project-local PyTorch.
# tch 0.24 pairs with torch==2.11.0; torch-sys finds it through the venv's `python` when
# LIBTORCH_USE_PYTORCH=1 and VIRTUAL_ENV is set.
CAIRN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CAIRN_ROOT
export VIRTUAL_ENV="$CAIRN_ROOT/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
# Keep libtorch on the two cores we have, and quiet.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
