"""One-line integrations of trainers people already use with hpctrain's runtime (stop flag,
progress, exact resume). Each module imports its trainer only when it is imported itself:
`hpctrain.integrations.hf` (Hugging Face Trainer: `HpctrainCallback`) needs transformers
(`pip install 'hpctrain[hf]'`), `hpctrain.integrations.lightning` (Lightning: `HpctrainCheckpoint`)
needs lightning (`pip install 'hpctrain[lightning]'`); examples/README.md says what each covers."""
