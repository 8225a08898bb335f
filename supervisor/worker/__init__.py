"""What a training script imports: the resumable sampler and fault injection for drills.

(The heartbeat sender, phase timers and collective watchdog join this package with the
worker SDK issue.)
"""
