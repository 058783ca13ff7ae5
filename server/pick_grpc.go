package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/route"
)

// grpcPickOpts reads a gRPC Match's pick options (pick.go), checking them.
func grpcPickOpts(req *kvindexv1.MatchRequest, q []uint64, m *model) (pickOpts, error) {
	if err := checkRequestID(req.GetRequestId()); err != nil {
		return pickOpts{}, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	o := pickOpts{track: req.GetPick(), id: req.GetRequestId(), tokens: len(q) * m.blockSize}
	if n := len(req.GetTokens()); n > 0 {
		o.tokens = n
	}
	if lm := req.GetLoad(); len(lm) > 0 {
		o.loads = make(map[string]*WorkerLoad, len(lm))
		for w, l := range lm {
			if l == nil {
				continue
			}
			wl := &WorkerLoad{Tokens: l.Tokens, PrefillTokens: l.PrefillTokens, ActiveBlocks: l.ActiveBlocks, KVUtil: l.KvUtil}
			if l.Requests != nil {
				v := int(*l.Requests)
				wl.Requests = &v
			}
			if l.Waiting != nil {
				v := int(*l.Waiting)
				wl.Waiting = &v
			}
			if err := wl.check(); err != nil {
				return pickOpts{}, status.Errorf(codes.InvalidArgument, "load: worker %q: %v", w, err)
			}
			o.loads[w] = wl
		}
	}
	return o, nil
}

// trackStatus is a failed track's gRPC status.
func trackStatus(err error) error {
	switch {
	case errors.Is(err, route.ErrDuplicate):
		return status.Error(codes.AlreadyExists, "request_id is already in flight")
	case errors.Is(err, route.ErrFull):
		return status.Errorf(codes.ResourceExhausted, "%v", err)
	}
	return status.Errorf(codes.InvalidArgument, "%v", err)
}

// grpcTrackRouted counts a Routed request with a request_id as routed (trackRouted).
func (s *Server) grpcTrackRouted(ctx context.Context, m *model, ns, worker string, req *kvindexv1.RoutedRequest, q []uint64) error {
	id := req.GetRequestId()
	if id == "" {
		return nil
	}
	if err := checkRequestID(id); err != nil {
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	tokens := len(q) * m.blockSize
	if n := len(req.GetTokens()); n > 0 {
		tokens = n
	}
	if err := s.trackRouted(ctx, m, ns, worker, id, q, tokens); err != nil {
		if errors.Is(err, route.ErrDuplicate) || errors.Is(err, route.ErrFull) {
			return trackStatus(err)
		}
		return status.Errorf(codes.Unavailable, "find matches: %v", err)
	}
	return nil
}

// Finished is POST /v1/finished over gRPC.
func (g *grpcService) Finished(_ context.Context, req *kvindexv1.FinishedRequest) (*kvindexv1.FinishedResponse, error) {
	id := req.GetRequestId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "request_id is required")
	}
	if err := checkRequestID(id); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	return &kvindexv1.FinishedResponse{Known: g.s.finished(id, req.GetFirstToken())}, nil
}
