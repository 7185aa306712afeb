# require-digest in Rego: the same rule as examples/policies/require-digest,
# for OPA-compiled modules (docs/wasm-abi.md section 11). Build and push:
#   opa build -t wasm -e berth/deny policy.rego
#   berth module push --kind opa bundle.tar.gz
package berth

import rego.v1

svc := input.object if input.hook == "service.apply"

svc := input.object.service if input.hook == "deploy"

deny contains msg if {
	svc.bundle != ""
	not startswith(svc.bundle, "sha256:")
	msg := sprintf("bundle %s is not named by digest; use sha256:<hex>", [svc.bundle])
}

deny contains msg if {
	svc.image != ""
	not contains(svc.image, "@sha256:")
	msg := sprintf("image %s is not pinned by digest", [svc.image])
}
