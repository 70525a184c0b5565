# Qwen3-0.6B (Qwen3 family: q/k norms, head_dim 128; tied embeddings).
MODEL_ARGS=(
   --swiglu
   --num-layers 28
   --hidden-size 1024
   --ffn-hidden-size 3072
   --num-attention-heads 16
   --group-query-attention
   --num-query-groups 8
   --use-rotary-position-embeddings
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-6
   --rotary-base 1000000
   --vocab-size 151936
   --kv-channels 128
   --qk-layernorm
)
