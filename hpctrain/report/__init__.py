"""`hpctrain report`: what a run did and what it cost, from its folder alone.

    data.load(run)         -> RunData   (metrics, starts, events, saves, checkpoints, GPU samples)
                                        (the metric lines as columns: columns.Metrics)
    summary.summarize(rd)  -> Summary   (wall time, GPU-hours, restarts, steps redone, time lost...)
    plots.write(runs, out) -> [Path]    (PNG files: loss, throughput, step time, GPU)

The three layers only pass plain records along, so other views (a sweep's runs side by side) can reuse
them. No torch, no click.
"""
