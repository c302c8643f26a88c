"""`--model hf:<folder>`: a Hugging Face model folder, built without its weights and loaded so each
rank reads only the slices it holds (docs/finetune.md).

The order, driven by the trainer (train_entry/trainer.py `_build`):
  1. build.meta_model: the transformers model from config.json on the meta device (no memory);
  2. the layout: DDP and DeepSpeed load first (every rank holds everything); FSDP2 and the mesh
     strategies shard the meta model (layout.py: the architecture's own TP plan, the pipeline
     split of model.model.layers), then load;
  3. load.materialize: to_empty (parameters keep their identity, so the optimizer built on them
     stays valid), each parameter's local rows/columns read from the safetensors (load.py), the
     non-persistent buffers (rotary inv_freq) recomputed by the model's own init, ties checked.
The folder itself (config.json, index, headers) is read without torch by hpctrain/kernel/hffolder.py,
so `submit` and `plan` check it before anything is queued.
"""
