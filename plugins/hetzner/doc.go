// Package hetzner is the Hetzner Cloud provider plugin (docs/plugins-hetzner.md):
// it creates, reads and deletes servers as resources of type [ResourceType],
// one per Berth machine, through github.com/hetznercloud/hcloud-go/v2.
//
// A create is idempotent by construction: the server is named after the
// machine id and labelled berth-machine=<id> and berth-managed=true, the
// label is looked up before anything is created, a name clash adopts the
// existing server, and every action the create starts is waited for, the
// server deleted when one fails. All API calls of one plugin go through one
// rate limiter, and all action waits through one batched poller.
package hetzner
