# A regular package, so that `tests` is this folder: SageMaker's dependency smdebug_rulesconfig
# installs a top-level `tests` package into site-packages, which would otherwise win the import.
