"""Build the Cython extensions (every ``octopis/*.pyx``); metadata lives in pyproject.toml."""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(f"octopis.{pyx.stem}", [str(pyx)], extra_compile_args=["-O3"])
    for pyx in sorted(Path("octopis").glob("*.pyx"))
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
    if extensions
    else [],
)
