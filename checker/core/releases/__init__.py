"""Each modelled SGLang release and its rules: the release table, start-up rules, argument checks,
the generated per-release support tables (pipeline parallelism, KV pool, model registry, config rules)."""
