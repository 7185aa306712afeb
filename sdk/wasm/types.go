package wasm

import "github.com/berthhq/berth/abi/routes"

// Aliases of the route-table types, so a route compiler needs one import.
type (
	abiwasmRoute = routes.Route
	abiwasmTable = routes.Table
)

// Route is one entry of the route table a [RoutesFunc] returns.
type Route = routes.Route

// Upstream is one workload serving a [Route].
type Upstream = routes.Upstream
