"""The recipe's sections as typed schemas, by part of the pipeline: `training`, `export` and `measure`, each
section a `strict.Strict` model; `common.recipe` puts them together into a `Recipe` and loads it."""
