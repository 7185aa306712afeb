// Package gateway is the edge gateway provider plugin: an HTTP reverse proxy
// routing by Host to a service's healthy workloads.
//
// [Proxy] is the data plane: an [net/http.Handler] that serves the route table
// core pushes ([github.com/berthhq/berth/abi/routes.Table]). The plugin glue
// that receives those tables over go-plugin lives beside it in this package.
package gateway
