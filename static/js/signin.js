// The sign-in page: the form goes to /api/auth/signin as JSON (the server takes no form posts), the
// server sets the HttpOnly cookie, and the page moves on to the chat.

import { api } from "./api.js";

const form = document.querySelector('[data-testid="signin-form"]');
const error = document.querySelector('[data-testid="signin-error"]');
// A single sign-on that came back refused says why through ?error= (server/web/oidc.py).
const SSO_ERRORS = {
  sso: "Single sign-on failed; try again.",
  disabled: "This account is disabled.",
};
error.textContent = SSO_ERRORS[new URL(location.href).searchParams.get("error")] || "";

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.textContent = "";
  const button = form.querySelector("button");
  button.disabled = true;
  try {
    await api("/api/auth/signin", {
      method: "POST",
      body: { name: form.elements.name.value.trim(), password: form.elements.password.value },
    });
    location.assign("/");
  } catch (failure) {
    error.textContent = failure.message;
    form.elements.password.select();
  } finally {
    button.disabled = false;
  }
});
