package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvindex/kvindex/internal/readlimit"
)

// ObjectScheme prefixes a snapshot location that names an object in a JetStream object
// store instead of a file: "jetstream-object://BUCKET/NAME". Replicas of one model group
// can then share their snapshots through the NATS cluster they already use: a new
// replica starts from the latest snapshot any of them wrote.
const ObjectScheme = "jetstream-object://"

// objectTimeout bounds one object store transfer.
const objectTimeout = time.Minute

// objectLocation splits a snapshot location into bucket and object name; ok is false
// for a file path.
func objectLocation(loc string) (bucket, name string, ok bool, err error) {
	rest, ok := strings.CutPrefix(loc, ObjectScheme)
	if !ok {
		return "", "", false, nil
	}
	bucket, name, found := strings.Cut(rest, "/")
	if !found || bucket == "" || name == "" {
		return "", "", true, fmt.Errorf("fabric: snapshot location %q: want %sBUCKET/NAME", loc, ObjectScheme)
	}
	return bucket, name, true, nil
}

// putObject stores a snapshot, creating the bucket if needed. An object store put
// replaces the previous object only once the new one is complete, so readers never see
// half a snapshot.
func putObject(js jetstream.JetStream, bucket, name string, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), objectTimeout)
	defer cancel()
	store, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: bucket})
	if err != nil {
		return fmt.Errorf("fabric: object store %s: %w", bucket, err)
	}
	if _, err := store.PutBytes(ctx, name, data); err != nil {
		return fmt.Errorf("fabric: object %s/%s: %w", bucket, name, err)
	}
	return nil
}

// getObject reads a snapshot; a missing bucket or object is os.ErrNotExist, as a missing
// file is.
func getObject(ctx context.Context, js jetstream.JetStream, bucket, name string, maxBytes int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, objectTimeout)
	defer cancel()
	store, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, os.ErrNotExist
	}
	if err != nil {
		return nil, fmt.Errorf("%w: object store %s: %v", ErrSnapshot, bucket, err)
	}
	obj, err := store.Get(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, os.ErrNotExist
	}
	if err != nil {
		return nil, fmt.Errorf("%w: object %s/%s: %v", ErrSnapshot, bucket, name, err)
	}
	defer obj.Close()
	// Bounded whatever the object's metadata claims: the read stops past maxBytes.
	data, err := readlimit.ReadAll(obj, maxBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: object %s/%s: %v", ErrSnapshot, bucket, name, err)
	}
	return data, nil
}
