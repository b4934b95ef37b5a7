"""
A2A v0.3.0 Protocol: Enhanced A2A-Specific Error Code Tests

This module provides enhanced tests for A2A-specific error codes -32003 to -32006
that can work with any SUT implementation regardless of declared capabilities.

The tests use creative approaches to trigger error conditions even on fully-featured SUTs,
ensuring comprehensive validation of A2A error handling compliance.

Reference: A2A v0.3.0 Specification Section 8.2 (A2A-Specific Errors)
"""

import logging
from typing import Dict, Any, Optional
import uuid

import pytest

from tck import message_utils
from tests.markers import mandatory
from tests.utils import transport_helpers
from tests.markers import mandatory_jsonrpc

logger = logging.getLogger(__name__)


def verify_a2a_error_response(response: Dict[str, Any], expected_code: int, expected_message_keywords: list = None) -> None:
    """
    Verify that a JSON-RPC response contains a proper A2A error code.

    Args:
        response: JSON-RPC response dictionary
        expected_code: Expected A2A error code
        expected_message_keywords: Optional keywords that should appear in error message
    """
    assert "error" in response, "Response should contain error object"

    error = response["error"]
    assert "code" in error, "Error object should contain code field"
    assert "message" in error, "Error object should contain message field"

    error_code = error["code"]
    error_message = error["message"]

    assert error_code == expected_code, f"Expected error code {expected_code}, got {error_code}"
    assert isinstance(error_message, str), "Error message should be a string"
    assert len(error_message) > 0, "Error message should not be empty"

    if expected_message_keywords:
        message_lower = error_message.lower()
        for keyword in expected_message_keywords:
            assert keyword.lower() in message_lower, f"Expected keyword '{keyword}' in error message: {error_message}"


def create_test_task(sut_client) -> Optional[str]:
    """Create a test task and return its ID, or None if creation fails."""
    try:
        req_id = message_utils.generate_request_id()
        test_message = {
            "role": "ROLE_USER",
            "parts": [{"text": "Test message for error testing"}],
            "messageId": f"msg-{req_id}",
        }

        message_response = transport_helpers.transport_send_message(sut_client, {"message": test_message})
        if "result" in message_response and isinstance(message_response["result"], dict):
            result = message_response["result"]
            if "task" in result and isinstance(result["task"], dict):
                task = result["task"]
                if "id" in task:
                    return task["id"]
    except Exception as e:
        logger.warning(f"Failed to create test task: {e}")

    return None


@mandatory
def test_push_notification_not_supported_error_32003_enhanced(sut_client, agent_card_data):
    """
    MANDATORY: A2A v0.3.0 Section 8.2 - PushNotificationNotSupportedError (-32003)

    Enhanced test that validates -32003 error handling through multiple strategies:
    1. If agent doesn't support push notifications: test direct rejection
    2. If agent supports push notifications: test edge cases that should fail

    This ensures the test provides value regardless of SUT capabilities.
    """
    # Get agent capabilities
    agent_card = None
    push_notifications_supported = False

    try:
        result = transport_helpers.transport_get_extended_agent_card(sut_client)
        if "result" in result and isinstance(result["result"], dict):
            agent_card = result["result"]
        else:
            # Fallback to public agent card from fixture
            agent_card = agent_card_data

        if agent_card:
            capabilities = agent_card.get("capabilities", {})
            push_notifications_supported = capabilities.get("pushNotifications", False)
    except Exception as e:
        logger.warning(f"Could not retrieve agent card: {e}")

    if not push_notifications_supported:
        # Test direct rejection for unsupported feature
        task_id = create_test_task(sut_client) or f"test-task-{message_utils.generate_request_id()}"
        config_id = str(uuid.uuid4())
        # Try to set push notification config on agent that doesn't support it
        # meshpoint: the 1.0 TaskPushNotificationConfig (as tests/optional/capabilities
        # sends it), passed alone: the helper takes (client, config[, extra_headers]).
        config = {"taskId": task_id, "id": config_id, "url": "https://test.example.com/webhook", "token": "test-token"}

        try:
            response = transport_helpers.transport_create_task_push_notification_config(sut_client, config)

            if "error" in response:
                error_code = response["error"]["code"]
                if error_code == -32003:
                    verify_a2a_error_response(response, -32003, ["push", "notification", "not", "supported"])
                    logger.info("✅ Successfully validated -32003 error for unsupported push notifications")
                    return
                elif error_code == -32601:
                    # Method not found is also acceptable
                    logger.info("Push notification methods not implemented (method not found)")
                    pytest.skip("Push notification methods not implemented - cannot test -32003")
                else:
                    pytest.fail(f"Expected -32003 or -32601, got {error_code}")
            else:
                pytest.fail("Expected error response for unsupported push notifications")

        except Exception as e:
            # If we get an exception, it might be the error we're looking for
            if "-32003" in str(e) or "not supported" in str(e).lower():
                logger.info("✅ Got expected push notification not supported error via exception")
                return
            else:
                raise
    else:
        # Agent supports push notifications - test edge cases that should fail
        task_id = create_test_task(sut_client) or f"test-task-{message_utils.generate_request_id()}"

        # Test 1: Try to delete a non-existent push notification config
        try:
            response = transport_helpers.transport_send_json_rpc_request(
                sut_client,
                "tasks/pushNotificationConfig/delete",
                {"id": task_id, "pushNotificationConfigId": f"non-existent-config-{uuid.uuid4()}"},
            )

            if "error" in response:
                error_code = response["error"]["code"]
                # This could be -32003 if the specific config operation isn't supported
                # or -32001 if the config ID is not found
                if error_code == -32003:
                    verify_a2a_error_response(response, -32003)
                    logger.info("✅ Successfully validated -32003 error for specific push notification operation")
                    return

        except Exception as e:
            if "-32003" in str(e):
                logger.info("✅ Got expected -32003 error for push notification operation")
                return

        # If we get here, the SUT supports push notifications and handles edge cases gracefully
        logger.info("✅ SUT properly supports push notifications - no -32003 errors to test")
        pytest.skip("SUT properly handles all push notification operations - cannot trigger -32003")


@mandatory
def test_unsupported_operation_error_32004_enhanced(sut_client):
    """
    MANDATORY: A2A v0.3.0 Section 8.2 - UnsupportedOperationError (-32004)

    Enhanced test for -32004 error using creative approaches to trigger unsupported operations.
    """
    req_id = message_utils.generate_request_id()

    # Strategy 1: Try to use unsupported configuration parameters
    test_message = {
        "role": "ROLE_USER",
        "parts": [{"text": "Test message with extreme parameters"}],
        "messageId": f"msg-{req_id}",
    }

    # Test with extremely large or invalid configuration that might be unsupported
    params = {
        "message": test_message,
        "configuration": {
            "returnImmediately": False,
            "historyLength": 999999999,  # Extremely large number
            "acceptedOutputModes": ["application/x-invalid-format"],
            # Add non-standard configuration fields
            "customUnsupportedField": "test-value",
            "extremeConfiguration": {"maxComplexity": 99999, "unsupportedFeature": True},
        },
    }

    try:
        response = transport_helpers.transport_send_json_rpc_request(sut_client, "SendMessage", params=params, id=req_id)

        if "error" in response:
            error_code = response["error"]["code"]
            if error_code == -32004:
                verify_a2a_error_response(response, -32004, ["operation", "not", "supported"])
                logger.info("✅ Successfully validated -32004 error for unsupported operation")
                return
            elif error_code == -32602:
                # Invalid params is also reasonable for this test
                logger.info("Got -32602 (invalid params) instead of -32004 - this is acceptable")

    except Exception as e:
        if "-32004" in str(e):
            logger.info("✅ Got expected -32004 error via exception")
            return

    # Strategy 2: Try to use a completely custom method that might not be supported
    try:
        response = transport_helpers.transport_send_json_rpc_request(
            sut_client, "agent/customUnsupportedOperation", params={"testParameter": "value"}, id=req_id
        )

        if "error" in response:
            error_code = response["error"]["code"]
            if error_code == -32004:
                verify_a2a_error_response(response, -32004)
                logger.info("✅ Successfully validated -32004 error for custom operation")
                return
            elif error_code == -32601:
                # Method not found is expected for this case
                logger.info("Got -32601 (method not found) for custom operation - this is expected")

    except Exception as e:
        if "-32004" in str(e):
            logger.info("✅ Got expected -32004 error for custom operation")
            return

    # If no -32004 errors were triggered, the SUT handles edge cases well
    logger.info("✅ SUT handles unsupported operations gracefully - robust implementation")
    pytest.skip("Could not trigger -32004 error - SUT handles edge cases robustly")


@mandatory
def test_content_type_not_supported_error_32005_enhanced(sut_client):
    """
    MANDATORY: A2A v0.3.0 Section 8.2 - ContentTypeNotSupportedError (-32005)

    Enhanced test for -32005 error by testing extreme or invalid content types.
    """
    req_id = message_utils.generate_request_id()

    # Strategy 1: Try message with completely unsupported MIME types
    test_message = {
        "role": "ROLE_USER",
        "parts": [
            {"text": "Test message"},
            {
                "file": {
                    "name": "test.xyz",
                    "mediaType": "application/x-completely-unsupported-binary-format-test",
                    "fileWithBytes": "dGVzdCBkYXRh",  # "test data" in base64
                },
            },
        ],
        "messageId": f"msg-{req_id}",
    }

    params = {
        "message": test_message,
        "configuration": {
            "acceptedOutputModes": [
                "application/x-non-existent-format",
                "text/x-impossible-format",
                "application/vnd.fake-vendor-specific-format",
            ]
        },
    }

    try:
        response = transport_helpers.transport_send_json_rpc_request(sut_client, "SendMessage", params=params, id=req_id)

        if "error" in response:
            error_code = response["error"]["code"]
            if error_code == -32005:
                verify_a2a_error_response(response, -32005, ["content", "type", "not", "supported"])
                logger.info("✅ Successfully validated -32005 error for unsupported content type")
                return
            elif error_code == -32602:
                # Invalid params is also reasonable
                logger.info("Got -32602 (invalid params) for unsupported content types")

    except Exception as e:
        if "-32005" in str(e):
            logger.info("✅ Got expected -32005 error via exception")
            return

    # Strategy 2: Try with invalid file format that might not be supported
    test_message_2 = {
        "role": "ROLE_USER",
        "parts": [
            {
                "file": {
                    "name": "corrupt.bin",
                    "mediaType": "application/octet-stream-corrupted-test-format",
                    "fileWithBytes": "INVALID_BASE64_CONTENT_THAT_SHOULD_CAUSE_ISSUES",
                },
            }
        ],
        "messageId": f"msg-{req_id}-2",
    }

    try:
        response = transport_helpers.transport_send_json_rpc_request(
            sut_client, "SendMessage", params={"message": test_message_2}, id=f"{req_id}-2"
        )

        if "error" in response:
            error_code = response["error"]["code"]
            if error_code == -32005:
                verify_a2a_error_response(response, -32005)
                logger.info("✅ Successfully validated -32005 error for invalid file format")
                return

    except Exception as e:
        if "-32005" in str(e):
            logger.info("✅ Got expected -32005 error for invalid content")
            return

    # If no -32005 errors were triggered, the SUT is very permissive with content types
    logger.info("✅ SUT accepts diverse content types gracefully - flexible implementation")
    pytest.skip("Could not trigger -32005 error - SUT accepts content types flexibly")


@mandatory
def test_invalid_agent_response_error_32006_enhanced(sut_client):
    """
    MANDATORY: A2A v0.3.0 Section 8.2 - InvalidAgentResponseError (-32006)

    Enhanced test for -32006 error. This error is typically internal to the agent,
    so we test scenarios that might cause the agent to generate invalid responses.
    """
    req_id = message_utils.generate_request_id()

    # Strategy 1: Try to trigger complex processing that might cause response generation issues
    complex_message = {
        "role": "ROLE_USER",
        "parts": [
            {"text": "Generate an extremely complex response with nested data"},
            {
                "data": {
                    "complexRequest": True,
                    "nestedLevels": {
                        "level1": {"level2": {"level3": {"level4": "deep nesting test"}}},
                        "arrays": [[[[["deeply nested arrays"]]]]],
                        "largeData": "x" * 10000,  # Large string that might cause issues
                    },
                },
            },
        ],
        "messageId": f"msg-{req_id}",
    }

    try:
        response = transport_helpers.transport_send_json_rpc_request(
            sut_client, "SendMessage", params={"message": complex_message}, id=req_id
        )

        if "error" in response:
            error_code = response["error"]["code"]
            if error_code == -32006:
                verify_a2a_error_response(response, -32006, ["invalid", "agent", "response"])
                logger.info("✅ Successfully validated -32006 error for invalid agent response")
                return

    except Exception as e:
        if "-32006" in str(e):
            logger.info("✅ Got expected -32006 error via exception")
            return

    # Strategy 2: Try operations that might strain the agent's response generation
    task_id = create_test_task(sut_client)
    if task_id:
        try:
            # Request task with extreme history length that might cause response issues
            response = transport_helpers.transport_get_task(sut_client, task_id, history_length=999999)

            if "error" in response:
                error_code = response["error"]["code"]
                if error_code == -32006:
                    verify_a2a_error_response(response, -32006)
                    logger.info("✅ Successfully validated -32006 error for extreme task request")
                    return

        except Exception as e:
            if "-32006" in str(e):
                logger.info("✅ Got expected -32006 error for extreme task request")
                return

    # -32006 is typically an internal error that's hard to trigger from the outside
    logger.info("✅ SUT generates valid responses consistently - robust implementation")
    pytest.skip("Could not trigger -32006 error - SUT response generation is robust")


@mandatory
def test_a2a_error_code_coverage_enhanced():
    """
    MANDATORY: A2A v0.3.0 Section 8.2 - A2A Error Code Coverage Summary

    Validates that the enhanced error code tests provide comprehensive coverage
    of A2A-specific error scenarios (-32003 to -32006).
    """
    logger.info("=== A2A Error Code Coverage Summary ===")
    logger.info("Enhanced tests completed for:")
    logger.info("  -32003: PushNotificationNotSupportedError")
    logger.info("  -32004: UnsupportedOperationError")
    logger.info("  -32005: ContentTypeNotSupportedError")
    logger.info("  -32006: InvalidAgentResponseError")
    logger.info("")
    logger.info("These enhanced tests provide value regardless of SUT capabilities by:")
    logger.info("  1. Testing error conditions when features are not supported")
    logger.info("  2. Testing edge cases and extreme parameters when features are supported")
    logger.info("  3. Validating robust error handling across different scenarios")
    logger.info("  4. Ensuring A2A specification compliance for error response structure")
    logger.info("")
    logger.info("✅ A2A error code testing coverage is comprehensive and robust")

    # This test always passes as it's a summary
    assert True, "A2A error code coverage summary completed"
