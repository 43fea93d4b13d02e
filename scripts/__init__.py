"""The Python each workflow stage runs: one module per stage plus small shared helpers.

Every module has pure functions that tests call directly and a `main()` the rule runs with
`python -m scripts.<stage>`.
"""
