import type * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import { buildBoard, labelVariable, statPanel, timeSeries, type Query } from '../panels';
import { INSTANCE, metric, RANGE, sel, SERVICES, sumIncrease, sumRate, type Service } from '../promql';

const XDS_EVENTS = 'infermesh_registry_xds_events_total';
const INSTANCES = 'infermesh_registry_mesh_instances';
const I = sel(INSTANCE);
/** The services that follow the registry's WatchModels stream (libs/registry-watch). */
const WATCHERS: Service[] = ['router', 'batcher', 'worker'];

function perService(services: readonly Service[], expr: (service: Service) => string, legend: string): Query[] {
  return services.map((service) => ({ expr: expr(service), legend: `${service}${legend}` }));
}

export function meshBoard(): dashboard.Dashboard {
  return buildBoard({
    uid: 'infermesh-mesh',
    title: 'infermesh / Mesh',
    description:
      "The service mesh: the registry's xDS control plane and the instances announced to it, each service's own xDS stream, and what every service's gRPC server refused or failed on purpose under the mesh policy (authorization, fault injection, mutual TLS); how fresh each service's model configuration is.",
    tags: ['mesh'],
    variables: [
      labelVariable(
        'instance',
        'Instance',
        'Replicas of any infermesh service.',
        'label_values(up{job=~"infermesh-.+"}, instance)',
      ),
    ],
    rows: [
      {
        title: 'Control plane (registry xDS)',
        panels: [
          timeSeries({
            title: 'xDS events',
            description:
              'xDS stream events per second at the control plane by event (sent, ack, nack: the client kept its last version, refused: a resource failed the check against the Envoy API) and resource type.',
            unit: 'ops',
            span: 9,
            queries: [{ expr: sumRate(XDS_EVENTS, I, ['event', 'type']), legend: '{{event}} {{type}}' }],
          }),
          statPanel({
            title: 'xDS NACKs and refused resources over the range',
            description:
              'Resource updates a client refused (NACK) and resources the control plane refused to serve, per resource type, over the whole time range: anything above 0 needs a look at the registry’s log.',
            unit: 'short',
            span: 5,
            thresholds: [
              { value: null, color: 'green' },
              { value: 1, color: 'red' },
            ],
            queries: [
              {
                expr: `${sumIncrease(XDS_EVENTS, sel(INSTANCE, 'event=~"nack|refused"'), ['type'], RANGE)} or ${sumIncrease(XDS_EVENTS, I, ['type'], RANGE)} * 0`,
                legend: '{{type}}',
              },
            ],
          }),
          timeSeries({
            title: 'xDS clients and policy changes',
            description:
              'xDS clients connected to each control plane replica, and changes of the mesh policy file per time step by outcome (applied, or refused: the running policy stays).',
            unit: 'short',
            span: 10,
            queries: [
              { expr: `sum by (instance) (infermesh_registry_xds_clients${I})`, legend: 'clients · {{instance}}' },
              {
                expr: sumIncrease('infermesh_registry_mesh_policy_changes_total', I, ['outcome']),
                legend: 'policy {{outcome}}',
              },
            ],
          }),
          timeSeries({
            title: "Services' own xDS streams",
            description:
              "Events of each service's own xDS stream per second: ACKs, NACKs (the update was refused; the last one stays), disconnections.",
            unit: 'ops',
            span: 24,
            legendTable: true,
            queries: perService(
              SERVICES,
              (s) => sumRate(metric(s, 'xds_client_events_total'), I, ['event', 'type']),
              ' {{event}} {{type}}',
            ),
          }),
        ],
      },
      {
        title: 'Instances',
        panels: [
          timeSeries({
            title: 'Mesh instances',
            description:
              'Instances announced to the control plane, by service and whether they serve (the most any registry replica knows).',
            unit: 'short',
            span: 16,
            stack: true,
            queries: [{ expr: `max by (service, serving) (${INSTANCES})`, legend: '{{service}} serving={{serving}}' }],
          }),
          statPanel({
            title: 'Instances not serving',
            description: 'Instances announced to the control plane that do not serve now, by service.',
            unit: 'short',
            span: 8,
            thresholds: [
              { value: null, color: 'green' },
              { value: 1, color: 'orange' },
            ],
            queries: [
              {
                expr: `max by (service) (${INSTANCES}{serving="false"}) or max by (service) (${INSTANCES}) * 0`,
                legend: '{{service}}',
              },
            ],
          }),
        ],
      },
      {
        title: 'Inbound policy (every gRPC server)',
        panels: [
          timeSeries({
            title: 'Injected faults',
            description:
              "Calls per second each service failed (abort) or delayed on purpose, as the mesh policy's inboundFault says, by method.",
            unit: 'reqps',
            span: 8,
            queries: perService(
              SERVICES,
              (s) => sumRate(metric(s, 'grpc_server_injected_faults_total'), I, ['method', 'fault']),
              ' {{method}} {{fault}}',
            ),
          }),
          timeSeries({
            title: 'Unauthorized calls',
            description:
              "Calls per second refused by the mesh policy's authorization (PERMISSION_DENIED) or before it was received (UNAVAILABLE), by method and caller identity.",
            unit: 'reqps',
            span: 8,
            queries: perService(
              SERVICES,
              (s) => sumRate(metric(s, 'grpc_server_unauthorized_calls_total'), I, ['method', 'caller']),
              ' {{method}} from {{caller}}',
            ),
          }),
          timeSeries({
            title: 'TLS handshake failures',
            description:
              'TLS connections per second refused during the handshake (no client certificate, one from another CA, an expired one), by reason.',
            unit: 'ops',
            span: 8,
            queries: perService(
              SERVICES,
              (s) => sumRate(metric(s, 'grpc_server_tls_handshake_failures_total'), I, ['reason']),
              ' {{reason}}',
            ),
          }),
        ],
      },
      {
        title: 'Model configuration (registry watch)',
        panels: [
          timeSeries({
            title: 'Registry watch connected',
            description:
              'Whether each replica’s WatchModels stream to the registry is open; while it is not, the replica serves with the last configuration it had.',
            unit: 'bool_yes_no',
            span: 8,
            min: 0,
            max: 1,
            queries: perService(
              WATCHERS,
              (s) => `min by (instance) (${metric(s, 'registry_watch_connected')}${I})`,
              ' {{instance}}',
            ),
          }),
          timeSeries({
            title: 'Configuration age',
            description:
              'How long the models a replica holds may have been out of date: 0 while its watch is connected, else the time since it was.',
            unit: 's',
            span: 8,
            queries: perService(
              WATCHERS,
              (s) => `max by (instance) (${metric(s, 'registry_watch_config_age_seconds')}${I})`,
              ' {{instance}}',
            ),
          }),
          timeSeries({
            title: 'Registry watch reconnects',
            description: 'Times per time step a replica opened its registry watch again after it failed.',
            unit: 'short',
            span: 8,
            queries: perService(
              WATCHERS,
              (s) => sumIncrease(metric(s, 'registry_watch_reconnects_total'), I, ['instance']),
              ' {{instance}}',
            ),
          }),
        ],
      },
    ],
  });
}
