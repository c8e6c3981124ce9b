"""Build the Cython extensions (every ``.pyx`` under ``octopis/``, and every plain module
typed by a ``.pxd`` beside it, compiled in place of the ``.py``); metadata lives in
pyproject.toml."""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(".".join(pyx.with_suffix("").parts), [str(pyx)], extra_compile_args=["-O3"])
    for pyx in sorted(Path("octopis").rglob("*.pyx"))
    + sorted(pxd.with_suffix(".py") for pxd in Path("octopis").rglob("*.pxd"))
    if pyx.exists()
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
    if extensions
    else [],
)
