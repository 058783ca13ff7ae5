package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	kvindexv1 "github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/engine"
	"github.com/kvindex/kvindex/server"
)

// TestWorkerDigests: /v1/workers and gRPC Workers carry each worker's digest (and its
// namespaces'), equal to the index's engine.Digest, and /metrics has
// kvindex_worker_digest{worker}; a worker the index does not know has the empty digest.
func TestWorkerDigests(t *testing.T) {
	index, err := engine.New(engine.Config{Shards: 2})
	require.NoError(t, err)
	t.Cleanup(func() { index.Close() })
	for i, ns := range []string{"", "m", "m", "n;salt=x"} {
		blocks := []engine.Block{{Content: uint64(i), Seq: uint64(10 * i)}, {Content: 7, Seq: uint64(10*i + 1)}}
		require.NoError(t, index.Apply(&engine.Event{Kind: engine.EventStored, Worker: fmt.Sprintf("w%d", i%2), Namespace: ns, Blocks: blocks}))
	}
	bl := bufconn.Listen(1 << 20)
	s, err := server.New(server.Config{Listen: "127.0.0.1:0", Models: map[string]int{"m": 4}}, server.Options{
		Index: index, GRPCListener: bl,
		Workers: func() []server.WorkerInfo {
			return []server.WorkerInfo{{Worker: "w0"}, {Worker: "w1"}, {Worker: "none"}}
		},
	})
	require.NoError(t, err)
	require.NoError(t, s.Start())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
	})
	var out struct{ Workers []server.WorkerInfo }
	require.Equal(t, 200, newClient(t, s.Addr()).do("GET", "/v1/workers", "", &out))
	require.Len(t, out.Workers, 3)
	for _, wi := range out.Workers {
		want, ok := index.Digest(wi.Worker)
		if !ok {
			want = engine.WorkerDigest{Namespaces: map[string]engine.Digest{}}
		}
		got, err := wi.Digest.WorkerDigest()
		require.NoError(t, err)
		require.Equal(t, want, got, wi.Worker)
	}
	w1, _ := index.Digest("w1")
	require.Len(t, w1.Namespaces, 2)

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return bl.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	resp, err := kvindexv1.NewIndexClient(conn).Workers(context.Background(), &kvindexv1.WorkersRequest{})
	require.NoError(t, err)
	require.Len(t, resp.Workers, 3)
	for _, w := range resp.Workers {
		want, _ := index.Digest(w.Worker)
		require.Equal(t, want.Sum, w.Digest, w.Worker)
		require.Equal(t, int64(want.Blocks), w.DigestBlocks)
		require.Len(t, w.NamespaceDigests, len(want.Namespaces))
		for _, nd := range w.NamespaceDigests {
			require.Equal(t, want.Namespaces[nd.Namespace].Sum, nd.Digest)
		}
	}

	// Only a NATS replica resyncs on request.
	var refusal struct{ Code string }
	require.Equal(t, 501, newClient(t, s.Addr()).do("POST", "/v1/workers/w0/resync", "", &refusal))
	require.Equal(t, "not_supported", refusal.Code)
	require.Equal(t, 501, newClient(t, s.Addr()).do("POST", "/v1/workers/"+url.PathEscape("http://10.0.0.1:8000/x")+"/resync", "", &refusal),
		"a worker id with slashes, escaped, is one path segment")

	var line string
	for _, l := range strings.Split(newClient(t, s.Addr()).text("/metrics"), "\n") {
		if strings.HasPrefix(l, `kvindex_worker_digest{worker="w1"} `) {
			line = l
		}
	}
	v, err := strconv.ParseFloat(strings.Fields(line + " x")[1], 64)
	require.NoError(t, err, "line %q", line)
	require.Equal(t, float64(w1.Sum>>12), v)
}

// FuzzDigestInfo: a /v1/workers digest from the network (kvindex doctor --compare, the
// peer check) decodes or fails, never panics; a digest written by NewDigestInfo reads
// back as itself.
func FuzzDigestInfo(f *testing.F) {
	f.Add([]byte(`{"sum":"00000000000000ff","blocks":3,"namespaces":{"":{"sum":"00000000000000ff","blocks":3}}}`), uint64(7), 2)
	f.Add([]byte(`{"sum":"zz","blocks":-1}`), uint64(0), 0)
	f.Add([]byte(`{"sum":"+0000000000000ff"}`), ^uint64(0), 1<<40)
	f.Fuzz(func(t *testing.T, data []byte, sum uint64, blocks int) {
		var d server.DigestInfo
		if json.Unmarshal(data, &d) == nil {
			_, _ = d.WorkerDigest()
		}
		want := engine.WorkerDigest{Digest: engine.Digest{Sum: sum, Blocks: blocks}, Namespaces: map[string]engine.Digest{"m": {Sum: ^sum, Blocks: blocks}}}
		got, err := server.NewDigestInfo(want).WorkerDigest()
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
}
