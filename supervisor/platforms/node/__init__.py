"""What runs on a node, beside the platforms that start it (local processes, Slurm steps,
Kubernetes pods): the torchrun agent that forks its ranks (:mod:`.forking_agent`), the local
platform's waiting agents (:mod:`.warm_agent`), the agent's command line and environment
(:mod:`.agent`) and the reading of its output (:mod:`.agent_output`).

Nothing is imported here: ``python -m supervisor.platforms.node.forking_agent`` loads only what
the agent needs."""
