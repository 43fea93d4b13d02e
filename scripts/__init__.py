"""The stage entry points the workflow's rules run, one module per stage: `python -m scripts.<stage>`.

Stages do not import each other: what two share lives in `pipeline/`, and the train stage's extensions of rfdetr in
`rfdetr_extensions/`. Each module has functions that tests call directly and a `main()` the rule runs.
"""
