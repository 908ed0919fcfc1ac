"""The recipes shipped with edgedistill, installed as `edgedistill.recipes`: one YAML file per experiment.

A recipe named without a folder (`edgedistill teacher sst2`, `extends: sst2`) is read from `recipes/` in the
working directory when it has one, else from here (`common.settings.recipe_folders`).
"""
