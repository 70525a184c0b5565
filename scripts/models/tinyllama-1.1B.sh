# TinyLlama-1.1B (Llama family; GQA 4 groups; separate output layer).
MODEL_ARGS=(
   --swiglu
   --num-layers 22
   --hidden-size 2048
   --ffn-hidden-size 5632
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 4
   --position-embedding-type rope
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-5
   --rotary-base 10000
   --vocab-size 32000
   --untie-embeddings-and-output-weights
)
