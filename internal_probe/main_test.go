// Package probe pins the chosen libraries in go.mod while the tree is being built; removed before the final tidy.
package probe

import (
	_ "github.com/FerretDB/FerretDB/ferretdb"
	_ "github.com/coder/websocket"
	_ "github.com/gowebpki/jcs"
	_ "github.com/hashicorp/go-hclog"
	_ "github.com/hashicorp/go-plugin"
	_ "github.com/labstack/echo/v4"
	_ "github.com/oklog/ulid/v2"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/spf13/cobra"
	_ "go.mongodb.org/mongo-driver/v2/mongo"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/proto"
	_ "gopkg.in/yaml.v3"
	_ "modernc.org/sqlite"
	_ "golang.org/x/sys/unix"
)
