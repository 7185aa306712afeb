package gateway

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"testing"
)

func TestZZProfile(t *testing.T) {
	if os.Getenv("ZZPROF") == "" {
		t.Skip()
	}
	bl, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(bl, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello, world\n") }))
	p := NewProxy(nil)
	p.SetTable(oneRoute(healthy("wl", bl.Addr().String())))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go NewServer(p).Serve(ln)
	f, _ := os.Create("/tmp/gate-prof.out")
	pprof.StartCPUProfile(f)
	out, err := exec.Command("wrk", "-t2", "-c64", "-d8s", "-H", "Host: "+testHost, "http://"+ln.Addr().String()+"/").CombinedOutput()
	pprof.StopCPUProfile()
	t.Log(string(out), err)
}
