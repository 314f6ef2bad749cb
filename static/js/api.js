/**
 * fetch wrappers for the JSON API: same-origin cookies, the CSRF header on every non-GET request,
 * and errors as ApiError {status, detail}.
 */

export class ApiError extends Error {
  constructor(status, detail, body = null) {
    super(detail || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.detail = detail || `HTTP ${status}`;
    this.body = body;
  }
}

function readCookie(name) {
  for (const part of document.cookie ? document.cookie.split(";") : []) {
    const eq = part.indexOf("=");
    if (eq !== -1 && part.slice(0, eq).trim() === name) {
      try {
        return decodeURIComponent(part.slice(eq + 1).trim());
      } catch {
        return part.slice(eq + 1).trim();
      }
    }
  }
  return "";
}

/** The CSRF token: the `csrftoken` cookie, else the one the server put in the page. */
export function csrfToken() {
  const fromCookie = readCookie("csrftoken");
  if (fromCookie) return fromCookie;
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.getAttribute("content") || "" : "";
}

const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/** Called on any 401 from the API (the page sets it to go to the login page). */
let onUnauthorized = null;
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

/** A short, human message for an error response body. */
async function errorDetail(res) {
  let body = null;
  let detail = "";
  try {
    const text = await res.text();
    try {
      body = JSON.parse(text);
    } catch {
      detail = text.slice(0, 300);
    }
  } catch {
    /* body unreadable */
  }
  if (body && typeof body === "object") {
    const d = body.detail ?? body.error ?? body.message;
    if (typeof d === "string") detail = d;
    else if (d != null) detail = JSON.stringify(d).slice(0, 300);
  }
  if (res.status === 429 && !detail) detail = "Too many requests; try again shortly.";
  return { body, detail: detail || `${res.status} ${res.statusText || "error"}`.trim() };
}

/**
 * fetch(path) with the CSRF header and an optional JSON body; returns the Response when it is OK,
 * throws ApiError otherwise (and TypeError/AbortError for network failures and aborts).
 */
export async function fetchRaw(path, { method = "GET", json, headers = {}, signal, cache } = {}) {
  const h = { ...headers };
  const m = method.toUpperCase();
  if (!SAFE_METHODS.has(m)) h["X-CSRFToken"] = csrfToken();
  let body;
  if (json !== undefined) {
    h["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  const res = await fetch(path, { method: m, headers: h, body, signal, credentials: "same-origin", cache });
  if (!res.ok) {
    const { body: errBody, detail } = await errorDetail(res);
    if (res.status === 401 && onUnauthorized && !path.startsWith("/api/auth/")) onUnauthorized();
    throw new ApiError(res.status, detail, errBody);
  }
  return res;
}

/** JSON request; resolves to the parsed body (null for 204 / empty). */
export async function request(path, options = {}) {
  const res = await fetchRaw(path, { ...options, headers: { Accept: "application/json", ...(options.headers || {}) } });
  if (res.status === 204) return null;
  const text = await res.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError(res.status, "The server sent a response that is not JSON.");
  }
}

export const api = {
  get: (path, opts) => request(path, { ...opts, method: "GET" }),
  post: (path, json, opts) => request(path, { ...opts, method: "POST", json }),
  patch: (path, json, opts) => request(path, { ...opts, method: "PATCH", json }),
  put: (path, json, opts) => request(path, { ...opts, method: "PUT", json }),
  del: (path, opts) => request(path, { ...opts, method: "DELETE" }),
  fetchRaw,
};

export const enc = encodeURIComponent;
