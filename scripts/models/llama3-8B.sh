# Meta-Llama-3-8B (Llama family; no RoPE scaling; separate output layer). Llama 3.1+ use llama3 RoPE scaling, not built.
MODEL_ARGS=(
   --swiglu
   --num-layers 32
   --hidden-size 4096
   --ffn-hidden-size 14336
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --position-embedding-type rope
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-5
   --rotary-base 500000
   --vocab-size 128256
   --untie-embeddings-and-output-weights
)
