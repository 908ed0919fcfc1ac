"""edgedistill: distil a Transformer teacher into a small, fast student, export it and serve it.

The stages live in the checkout's top-level folders (`common/`, `distill/`, `export/`, `serve/`, `bench/`,
`loadtests/`, `report/`) and are installed as subpackages of this one, so that no generic top-level name
(`common`, `export`, `report`, ...) is taken in an environment.
"""
