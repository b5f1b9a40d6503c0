// TypeScript declarations for context-mode.mjs (the client itself stays plain JavaScript with no build step).
// The shapes follow the service's contract (docs/design.md; GET /openapi.json); fields the service may add
// later are allowed by the index signatures.

/** HTTP statuses worth retrying: busy (429) or storage briefly unavailable (503). */
export const RETRY_STATUSES: Set<number>;

/** One context unit as pushed (README, "The unit"). */
export interface Unit {
  type: string;
  source: string;
  content: string;
  timestamp?: number;
  ttl?: number;
  metadata?: Record<string, unknown>;
  parent_cid?: string;
  cid?: string;
}

/** A stored unit as the service answers it. */
export interface StoredUnit extends Unit {
  cid: string;
  timestamp: number;
  seq?: number;
  expires_at?: number;
  [field: string]: unknown;
}

export interface PushResult {
  status: "ok" | "duplicate";
  cid: string;
  seq?: number;
  indexed?: boolean;
  [field: string]: unknown;
}

export type BatchResult =
  | { index: number; status: "ok" | "duplicate"; cid: string; seq?: number }
  | { index: number; status: "error"; code: string; error: string; field?: string | null };

export interface SearchHit extends StoredUnit {
  score: number;
}

export interface SearchAnswer {
  results: SearchHit[];
  [field: string]: unknown;
}

export interface RecallHit {
  cid: string;
  type: string;
  source: string;
  score: number;
  text: string;
}

export interface MakeUnitOptions {
  type?: string;
  source: string;
  ttl?: number;
  timestamp?: number;
  metadata?: Record<string, unknown>;
  parentCid?: string;
}

/** Search parameters (the service's names): top_k, types, source, since, until, min_score, consistency, ... */
export type SearchParams = Record<string, unknown>;

export function computeCid(content: string, timestamp: number | string, source: string): Promise<string>;
export function makeUnit(content: string, options: MakeUnitOptions): Promise<Unit & { cid: string; timestamp: number }>;

export class ContextModeError extends Error {
  constructor(message: string, options?: { status?: number | null; code?: string; field?: string | null; body?: unknown });
  status: number | null;
  code: string;
  field: string | null;
  body: unknown;
  readonly retryable: boolean;
}

export interface ClientOptions {
  /** base URL, e.g. "http://localhost:5000" */
  url?: string;
  /** sent as "Authorization: Bearer <key>" */
  apiKey?: string;
  timeoutMs?: number;
  retries?: number;
  backoffMs?: number;
  maxBackoffMs?: number;
  fetch?: typeof globalThis.fetch;
}

export interface Tool {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  title?: string;
  endpoint?: string;
  auth_type?: string;
  tags?: string[];
  metadata?: Record<string, unknown>;
  output_schema?: Record<string, unknown>;
  [field: string]: unknown;
}

export interface StreamOptions {
  lastEventId?: number | string | null;
  reconnect?: boolean;
}

export class ContextModeClient {
  constructor(options?: ClientOptions);
  url: string;
  apiKey?: string;
  request<T = any>(method: string, path: string, body?: unknown): Promise<T>;
  push(contentOrUnit: string | Unit | Promise<Unit>, options?: Partial<MakeUnitOptions>): Promise<PushResult>;
  pushBatch(units: Array<Unit | Promise<Unit>>): Promise<BatchResult[]>;
  search(query: string, params?: SearchParams): Promise<SearchAnswer>;
  context(query: string, params?: SearchParams): Promise<{ context: string; [field: string]: unknown }>;
  getUnit(cid: string): Promise<StoredUnit>;
  lineage(cid: string): Promise<{ [field: string]: unknown }>;
  deleteUnit(cid: string): Promise<{ [field: string]: unknown }>;
  listUnits(options?: { limit?: number; cursor?: string } & SearchParams): Promise<{ units: StoredUnit[]; next_cursor?: string | null }>;
  iterUnits(options?: { pageSize?: number } & SearchParams): AsyncGenerator<StoredUnit, void, undefined>;
  stats(): Promise<{ [field: string]: unknown }>;
  exportUnits(filters?: SearchParams): AsyncGenerator<StoredUnit, void, undefined>;
  forget(params?: SearchParams & { confirm?: string }): Promise<{ [field: string]: unknown }>;
  stream(params?: SearchParams, options?: StreamOptions): UnitStream;
  watch(onUnit: (unit: StoredUnit) => unknown, params?: SearchParams, options?: StreamOptions): UnitStream;
  registerTool(tool: Tool): Promise<{ [field: string]: unknown }>;
  updateTool(name: string, tool: Tool): Promise<{ [field: string]: unknown }>;
  getTool(name: string): Promise<Tool>;
  deleteTool(name: string): Promise<{ [field: string]: unknown }>;
  findTools(query: string, options?: { topK?: number; tags?: string[]; authType?: string }): Promise<Tool[]>;
  listTools(options?: { tags?: string[]; authType?: string; pageSize?: number }): AsyncGenerator<Tool, void, undefined>;
  recall(query: string, options?: { threshold?: number; topK?: number; maxChars?: number } & SearchParams): Promise<RecallHit[]>;
}

/** An open GET /mcp/stream: an async iterable of units that resumes after `lastEventId` when it reconnects. */
export class UnitStream implements AsyncIterable<StoredUnit> {
  constructor(client: ContextModeClient, params: SearchParams, lastEventId: number | string | null, reconnect: boolean);
  lastEventId: number | string | null;
  closed: boolean;
  close(): void;
  [Symbol.asyncIterator](): AsyncGenerator<StoredUnit, void, undefined>;
}
