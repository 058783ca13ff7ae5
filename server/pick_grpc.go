package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/kvindexv1"
)

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
