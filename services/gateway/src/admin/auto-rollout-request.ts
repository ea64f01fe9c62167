import { create } from '@bufbuild/protobuf';
import { Errors } from '@infermesh/grpc';
import {
  AutoRolloutAnalysisSchema,
  type StartAutoRolloutRequest,
  StartAutoRolloutRequestSchema,
} from '@infermesh/proto/gen/infermesh/registry/v1/registry_pb';
import { checkAnalysis, checkVersionId } from '@infermesh/rollout';
import { jsonObject, messageFromJson } from './registry-json';

const EXAMPLE =
  '{"version": "3", "analysis": {"steps": [5, 10, 25, 50, 100], "intervalMs": "60000", "minRequests": "200", "maxErrorRateIncrease": 0.005, "maxP99Ratio": 1.2}}';

/**
 * The StartAutoRollout of `model` that a REST body asks for: `{"version": "<id>", "analysis":
 * AutoRolloutAnalysis}`, the analysis in the protobuf JSON mapping. Anything else is an
 * INVALID_ARGUMENT naming the field: a missing or malformed version or analysis, an unknown field, or
 * an analysis the registry would refuse (libs/rollout's checkAnalysis, the one the registry runs).
 */
export function startAutoRolloutFromJson(body: unknown, model: string): StartAutoRolloutRequest {
  const { version, analysis, ...rest } = jsonObject(body, EXAMPLE);
  const unknown = Object.keys(rest);
  if (unknown.length > 0)
    throw Errors.invalidRequest(`unknown field "${unknown[0]}" in the request body: expected "version" and "analysis"`);
  if (version === undefined)
    throw Errors.invalidRequest(`"version" is missing: the version to roll out, e.g. ${EXAMPLE}`);
  if (typeof version !== 'string') throw Errors.invalidRequest('"version" must be a version id as a string, e.g. "3"');
  if (analysis === undefined || analysis === null)
    throw Errors.invalidRequest(`"analysis" is missing: how the rollout proceeds, e.g. ${EXAMPLE}`);
  if (typeof analysis !== 'object' || Array.isArray(analysis))
    throw Errors.invalidRequest(`"analysis" must be a JSON object (an AutoRolloutAnalysis), e.g. ${EXAMPLE}`);
  const parsed = checkAnalysis(messageFromJson(AutoRolloutAnalysisSchema, analysis));
  return create(StartAutoRolloutRequestSchema, { model, version: checkVersionId(version), analysis: parsed });
}
