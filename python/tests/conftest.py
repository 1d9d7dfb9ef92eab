"""The tests run on the emulated CUDA runtime: build the package with the
cargo feature `emulator` (see .ci/python)."""

import wirespeed

wirespeed._use_emulator()
