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

// Timeouts are a [Route]'s upstream timeouts in milliseconds; zero fields
// mean the gateway's defaults (docs/plugins.md section 5.4).
type Timeouts = routes.Timeouts

// HeaderMatch is one request-header condition of a [Route]
// (docs/routes.md section 3).
type HeaderMatch = routes.HeaderMatch
