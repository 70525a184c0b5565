# The tiny-qwen3 preset (81k params, character tokenizer, CPU): the CPU examples' model, flags checked like a real one.
MODEL_ARGS=(
   --swiglu
   --num-layers 2
   --hidden-size 64
   --ffn-hidden-size 128
   --num-attention-heads 4
   --group-query-attention
   --num-query-groups 2
   --kv-channels 16
   --position-embedding-type rope
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 10000
   --vocab-size 100
   --make-vocab-size-divisible-by 1
   --qk-layernorm
   --max-position-embeddings 512
)
