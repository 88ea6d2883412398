"""Stage 3, the plan: the memory and CPUs a build may really use (``budget``), what a job needs
(``memory_model``), the jobs and nvcc threads that fit (``planner``) and the order the objects
compile in (``critical_path``)."""
