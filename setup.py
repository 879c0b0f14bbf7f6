"""Build hook for the one optional C extension (everything else is in pyproject.toml).

``energon_pack.pixels._pixel_simd`` holds the worker's pixel loops with AVX-512: PIL's two
resampling passes and the patch layout (see ``energon_pack/pixels/pixel_simd.py``). It is
optional: where it does not compile (no C compiler, not x86-64) the install goes on and the
numba kernels give the same values.
"""

import platform

from setuptools import Extension, setup

extensions = []
if platform.machine().lower() in ("x86_64", "amd64"):
    extensions.append(
        Extension(
            "energon_pack.pixels._pixel_simd",
            ["energon_pack/pixels/_pixel_simd.c"],
            # no fused multiply-add: the values must equal the float32 table's operations exactly
            extra_compile_args=["-O3", "-ffp-contract=off"],
            optional=True,
        )
    )

setup(ext_modules=extensions)
