package wasm

import "embed"

// Schemas holds the JSON Schemas (draft 2020-12) of every input and output of
// ABI v1: schema/metadata.json, schema/policy_input.json,
// schema/policy_output.json, schema/routes_input.json and
// schema/routes_output.json (docs/wasm-abi.md section 5).
//
//go:embed schema/*.json
var Schemas embed.FS
