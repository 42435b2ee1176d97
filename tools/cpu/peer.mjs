// Runs llama.cpp (through the npm package node-llama-cpp) on a GGUF file:
// greedy decoding of a fixed prompt for N tokens with a fixed thread count,
// printing the prompt ids, the generated ids, the prefill and decode rates
// and the CPU features of the library it loaded as one JSON line, so that
// parity with this engine and the peer benchmark can be built on it.
//
//	npm install --prefix DIR node-llama-cpp@3.21.1
//	NODE_PATH=DIR/node_modules node tools/cpu/peer.mjs -m model.gguf [-p PROMPT | --ids 1,2,3] [-n 32] [-t 2] [--kv f32] [--no-fa] [--batch 512] [--ppl]
//
// The prompt is tokenized by llama.cpp from the file's own vocabulary
// (with BOS when the file says so) unless --ids gives the ids directly.
// --kv sets the K and V cache type (llama.cpp's default is f16; f32 keeps
// them as this engine does), --no-fa turns flash attention off. --batch sets the
// most tokens llama.cpp evaluates in one pass (512; 1 evaluates the prompt a
// token at a time, through its decode kernels). --ppl
// generates nothing: it evaluates the prompt in one pass and prints, for
// every prompt token after the first, its negative log-probability under
// the full softmax of the logits before it (temperature 1, no truncation),
// as "nll", and the smallest number of candidates a position reported, as
// "candidates" (the vocabulary size when no sampler truncated them).
import { createRequire } from "node:module";
import path from "node:path";
import process from "node:process";

const require = createRequire(path.join(process.cwd(), "noop.js"));
const { getLlama, LlamaLogLevel } = await import(require.resolve("node-llama-cpp"));

function parseArgs(argv) {
	const a = { model: "", prompt: "The capital of France is", ids: null, n: 32, threads: 2, ctx: 1024, batch: 512, kv: "", fa: "auto", ppl: false };
	for (let i = 0; i < argv.length; i++) {
		const v = argv[i + 1];
		switch (argv[i]) {
			case "-m": a.model = v; i++; break;
			case "-p": a.prompt = v; i++; break;
			case "--ids": a.ids = v.split(",").map(Number); i++; break;
			case "-n": a.n = Number(v); i++; break;
			case "-t": a.threads = Number(v); i++; break;
			case "-c": a.ctx = Number(v); i++; break;
			case "--batch": a.batch = Number(v); i++; break;
			case "--kv": a.kv = v.toUpperCase(); i++; break;
			case "--no-fa": a.fa = false; break;
			case "--ppl": a.ppl = true; break;
			default: throw new Error(`unknown argument ${argv[i]}`);
		}
	}
	if (!a.model) throw new Error("-m FILE.gguf is required");
	return a;
}

const args = parseArgs(process.argv.slice(2));
const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, build: "never" });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0, useMmap: true });
const contextOptions = { contextSize: args.ctx, threads: args.threads, batchSize: args.batch, flashAttention: args.fa };
if (args.kv) {
	contextOptions.experimentalKvCacheKeyType = args.kv;
	contextOptions.experimentalKvCacheValueType = args.kv;
}
const context = await model.createContext(contextOptions);
const sequence = context.getSequence();
const promptIds = args.ids ?? Array.from(model.tokenize(args.prompt, true));

if (args.ppl) {
	// The softmax at temperature 1 over every candidate.
	const next = { probabilities: true, options: { temperature: 1, topK: 0, topP: 1, minP: 0 } };
	const input = promptIds.map((id, i) => (i + 1 < promptIds.length ? [id, { generateNext: next }] : id));
	const res = await sequence.controlledEvaluate(input);
	const nll = [];
	let candidates = Infinity;
	for (let i = 0; i + 1 < promptIds.length; i++) {
		const probs = res[i].next.probabilities;
		candidates = Math.min(candidates, probs.size);
		const p = probs.get(promptIds[i + 1]);
		if (!(p > 0)) throw new Error(`--ppl: token ${promptIds[i + 1]} at ${i + 1} has no probability (${p}) among ${probs.size} candidates`);
		nll.push(-Math.log(p));
	}
	console.log(JSON.stringify({ model: path.basename(args.model), prompt_ids: promptIds, nll, candidates }));
	await context.dispose();
	await model.dispose();
	await llama.dispose();
	process.exit(0);
}

const out = [];
const t0 = performance.now();
let tFirst = 0;
for await (const token of sequence.evaluate(promptIds, { temperature: 0 })) {
	if (out.length === 0) tFirst = performance.now();
	out.push(token);
	if (out.length >= args.n) break;
}
const t1 = performance.now();
const prefillS = (tFirst - t0) / 1000;
const decodeS = (t1 - tFirst) / 1000;
console.log(JSON.stringify({
	model: path.basename(args.model),
	threads: args.threads,
	prompt_ids: promptIds,
	ids: out,
	text: model.detokenize(out),
	prefill_tok_s: promptIds.length / prefillS,
	decode_tok_s: (out.length - 1) / decodeS,
	cpu: llama.cpuMathCores !== undefined ? llama.cpuMathCores : null,
	// The features of the CPU library llama.cpp loaded (its variant).
	backend: (llama.systemInfo ?? "").replace(/\s*\|\s*$/, "").trim(),
}));
await context.dispose();
await model.dispose();
await llama.dispose();
