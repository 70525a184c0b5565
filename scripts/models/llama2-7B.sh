# Llama-2-7b (Llama family; multi-head attention, no GQA; separate output layer).
MODEL_ARGS=(
   --swiglu
   --num-layers 32
   --hidden-size 4096
   --ffn-hidden-size 11008
   --num-attention-heads 32
   --position-embedding-type rope
   --disable-bias-linear
   --normalization "RMSNorm"
   --norm-epsilon 1e-5
   --rotary-base 10000
   --vocab-size 32000
   --untie-embeddings-and-output-weights
)
